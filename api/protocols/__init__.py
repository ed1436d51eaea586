"""Foreign protocols over the job queue: TF Serving's REST API (`tfserving/`) and the Open
Inference Protocol (`oip/`), each a folder of its codec (pure shapes) and its routes, and
`facade.py`, what both share (a request is one job of the caller's tenant, waited for).
"""
