"""The client protocols (Chat Completions, OpenAI Responses, Anthropic Messages) and what they
share: the adapter interface and its base (``base``), one adapter per protocol, the
translations between them, server-sent events and the SSE relay, the body checks.
"""
