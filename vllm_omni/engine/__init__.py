"""The orchestrator: builds the stage graph from a deploy config, runs stages on their
backends, moves data through connectors, streams outputs, aborts. Never imports server,
session or protocol."""
