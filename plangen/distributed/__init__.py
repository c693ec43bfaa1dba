"""Processes and process groups: launching ranks with gloo, a fake group for shapes in one process,
counting collectives.

The machinery under the numerical checks (:mod:`plangen.check`), the cost model
(:mod:`plangen.cost`) and the tests; the runtime itself runs in the caller's processes.
"""
