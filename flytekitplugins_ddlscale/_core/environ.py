"""Environment variables set for a block and put back afterwards (the connection variables a run sees)."""
import contextlib
import os
import sys
from typing import Any, Dict, Iterator, Mapping


@contextlib.contextmanager
def environ_set(values: Mapping[str, str]) -> Iterator[Dict[str, str]]:
    """Set ``values`` in ``os.environ`` for the block; restore what was there before on exit.

    Dask reads its ``DASK_*`` settings from the environment once, when imported: in a process that
    imported it already, those of ``values`` (a local cluster's TLS files) also go into its
    configuration for the block, so a ``Client`` made in the block uses them. A Dask first imported
    inside the block read them as its own; at the block's end its configuration is read again from
    its files and the restored environment (``dask.config.refresh``), so none of them outlives the block.
    """
    saved = {key: os.environ.get(key) for key in values}
    dask_before = "dask.config" in sys.modules
    os.environ.update(values)
    try:
        with _dask_config_set(values):
            yield dict(values)
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        config = sys.modules.get("dask.config")
        if config is not None and not dask_before and any(key.startswith("DASK_") for key in values):
            config.refresh()


def _dask_config_set(values: Mapping[str, str]) -> "contextlib.AbstractContextManager[Any]":
    """``dask.config.set`` of the ``DASK_*`` entries of ``values`` when Dask is imported, else nothing."""
    dask_values = {key: value for key, value in values.items() if key.startswith("DASK_")}
    config = sys.modules.get("dask.config")
    if config is None or not dask_values:
        return contextlib.nullcontext()
    return config.set(_dotted(config.collect_env(dask_values)))  # type: ignore[no-any-return]


def _dotted(tree: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``: ``dask.config.set`` replaces a whole subtree given a mapping."""
    flat: Dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_dotted(value, name + "."))
        else:
            flat[name] = value
    return flat
