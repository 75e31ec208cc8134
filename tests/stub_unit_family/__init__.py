"""A second natively duplex family, for tests only: it lives in this folder and one registry
entry (tests/test_stub_unit_family.py adds it), as a new family would."""
