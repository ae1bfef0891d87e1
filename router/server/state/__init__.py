"""Run-state stores (run pins, step counters, admission counters): the interface and the
in-memory store, the Redis store and its Lua scripts, the Redis-with-fallback store, and
the prefix index shared across routers through Redis.
"""
