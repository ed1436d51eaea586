"""The object store beside the database: large tensors by reference (DESIGN §13)."""

from tffleet.objectstore.store import (
    ObjectMissing,
    ObjectStore,
    StoreUnavailable,
    open_store,
)
from tffleet.objectstore.urls import parse_store_url

__all__ = ["ObjectMissing", "ObjectStore", "StoreUnavailable", "open_store", "parse_store_url"]
