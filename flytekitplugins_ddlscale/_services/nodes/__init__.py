"""What a scaling node is, apart from Flyte: its task type names, its configuration, its typed outcome.

The task types (:mod:`..tasks`) and the Flyte 2 nodes (:mod:`..flyte2`) build
tasks from these and run them with :mod:`.run`; the Flyte connector
(:mod:`..connector`) reads the same configuration back from a task template
and returns the same outcomes, without any of them importing another.
"""
