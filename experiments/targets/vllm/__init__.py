"""The real vLLM + LMCache target: engine environments, tiny model, process launcher."""
