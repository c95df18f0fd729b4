"""Where deltacast meets inference engines: layouts learned from an engine's own loader
(``layout``), and glue that builds vLLM's and SGLang's real model classes on a CPU
(``vllm_model``, ``sglang_model``; they import the engine, so only inside its venv)."""
