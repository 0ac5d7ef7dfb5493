"""How scaling nodes are named in Flyte: the output name, qualified task names."""
from typing import Optional

OUTPUT_NAME = "o0"
"""The single output's name, as for function tasks, so ``up = scale_up()`` is the outcome itself."""


def qualified_name(name: str, module: Optional[str]) -> str:
    """``module.name`` for a plain ``name`` defined in ``module``; dotted names are taken as given."""
    if module and "." not in name:
        return f"{module}.{name}"
    return name
