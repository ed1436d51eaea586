"""tffleet: asynchronous inference jobs on TensorFlow models, run by a fleet of Celery workers."""

__version__ = "0.1.0"
