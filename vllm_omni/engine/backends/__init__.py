"""How stages run: step workers for torch stage programs, engine hosts for drivers with their
own scheduler (vLLM), and the generic vLLM plumbing families build their drivers from."""
