"""What a scaling node is, apart from Flyte: one module per node type, and what they share.

Each node type's module (:mod:`.scale`, :mod:`.wait`, :mod:`.restart`,
:mod:`.restore`) declares its configuration, its typed outcome, its run in
a task, its summary line and its connector create, tied together in one
:class:`~.kinds.NodeKind`; :mod:`.registry` lists them. The task types
(:mod:`...tasks`), the Flyte 2 nodes (:mod:`...flyte2`) and the Flyte
connectors build on the kinds without any of them importing another.
"""
