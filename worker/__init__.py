"""Celery workers: the app, device pinning per child, the model runtime, batching.

Only `worker/runtime/` (and what it is called from in a child) imports TensorFlow; the Celery
main process imports `worker.app` and `worker.tasks`, which never do.
"""
