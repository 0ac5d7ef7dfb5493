"""What a scaling node is, apart from Flyte: its task type names, its configuration, its typed outcome.

The task types (:mod:`..tasks`) build Flyte tasks from these; the Flyte
connector (:mod:`..connector`) reads the same configuration back from a task
template and returns the same outcomes, without either importing the other.
"""
