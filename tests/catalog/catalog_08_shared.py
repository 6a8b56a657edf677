"""What notebook 08's catalogs share: minus infinity, and the hidden case every correct variant also
passes."""
INF = float("inf")


HIDDEN = {"seed": 5, "batch": 3}


def passes(check, fn):
    check(fn)
    check(fn, **HIDDEN)
