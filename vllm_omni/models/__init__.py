"""Model families: stage bridges, non-vLLM modules, vLLM registrations, tiny builders."""
