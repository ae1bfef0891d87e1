from router.native import prefer

prefer(__name__, __path__)  # the compiled group's shared library, router._native__mypyc
