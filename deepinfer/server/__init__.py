"""The OpenAI-compatible HTTP server: ``deepinfer serve`` (see docs/serve.md).

- engine_loop.py: one thread owns the LLM and steps it; HTTP handlers submit requests and await
  their outputs (they never run model code);
- protocol.py: OpenAI request bodies -> prompts and SamplingParams; errors in OpenAI's shape;
- app.py: the FastAPI app (routes, streaming, API key, metrics).
"""
