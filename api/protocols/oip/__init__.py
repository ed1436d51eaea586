"""The Open Inference Protocol (KServe's v2, Triton's HTTP/REST API): `codec.py` an infer
request read and its answer written, `binary.py` the binary tensor data extension's bytes,
`metadata.py` server and model metadata, model configuration and the repository index (all
pure functions), and `routes.py` the routes.
"""
