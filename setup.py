"""Packaging for flytekitplugins-ddlscale.

Install with the pinned set in ``constraints.txt`` (see README): unpinned
resolution of flytekit's dependency tree can backtrack for a long time.
"""
import platform
import sys

from setuptools import find_packages, setup

# The Python versions flytekit 1.16 supports (its Requires-Python: <3.13,>=3.10; on 3.13 pyflyte fails on
# start-up), each with a tested set of pins in constraints.txt. pip refuses other versions from
# python_requires below; uv ignores the upper bound there, so installing from source refuses them here.
SUPPORTED = ((3, 10), (3, 12))
if not SUPPORTED[0] <= sys.version_info[:2] <= SUPPORTED[1]:
    sys.exit(
        f"flytekitplugins-ddlscale supports Python 3.10 to 3.12 (as flytekit 1.16 does), not "
        f"{platform.python_version()}: make the virtual environment with one of those, "
        "e.g. `python3.12 -m venv .venv`"
    )

PLUGIN_NAME = "ddlscale"
MICROLIB_NAME = f"flytekitplugins-{PLUGIN_NAME}"

setup(
    name=MICROLIB_NAME,
    version="0.1.0",
    description="Explicit, typed cluster scaling for Flyte and Domino Flows "
    "(Ray, Spark, Dask and MPI clusters)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["flytekitplugins_ddlscale", "flytekitplugins_ddlscale.*"]),
    package_data={"flytekitplugins_ddlscale": ["py.typed", "data/*.yaml"]},
    python_requires=">=3.10,<3.13",
    install_requires=[
        # The connector base and `pyflyte serve connector` exist from flytekit 1.16.
        "flytekit>=1.16,<2",
        "httpx>=0.27",
        "kubernetes>=29",
        "dask[distributed]>=2024.1",
        # Local clusters' own certificate authority and certificates (backends/local/_secrets.py).
        "cryptography>=42",
        "pyyaml>=6",
        # Processes of local clusters and of claim holders (backends/local/_procs.py, _core/leases.py); from 7.1
        # a process's create_time() moves with the boot time when the clock is set, so their difference holds.
        "psutil>=7.1",
        # Unpack: one declaration of a phase's options types every phase surface's keywords.
        "typing-extensions>=4.7",
    ],
    extras_require={
        # pytest 9 ignores the worker groups pytest-xdist 3.8 sets (xdist_group): under pytest 9 a
        # module's tests spread over workers and each starts its own clusters.
        "test": ["pytest>=8,<9", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "jsonschema>=4.20", "cryptography>=42",
                 "dask-kubernetes>=2024.1",
                 # The flyte tier's S3 store (moto's server: presigned uploads, as the data proxy needs).
                 "moto[s3]>=5.1", "flask>=3", "flask-cors>=4"],
        "bench": ["matplotlib>=3.8"],
        # The connector service (`pyflyte serve connector`): its metrics and gRPC health checks.
        "connector": ["prometheus-client>=0.20", "grpcio-health-checking>=1.60"],
        # ray[default]: the dashboard (State API, which readiness reads) and the client server (ray://).
        "ray": ["ray[default]>=2.9"],
        "spark": ["pyspark>=4.0,<5"],
        # The Flyte 2 surface (flytekitplugins_ddlscale/flyte2/): the `flyte` SDK beside flytekit.
        "flyte2": ["flyte>=2.12,<3"],
    },
    entry_points={
        "flytekit.plugins": [f"{PLUGIN_NAME}=flytekitplugins_ddlscale.connector_entry"],
        "console_scripts": ["ddlscale=flytekitplugins_ddlscale.cli:main"],
        # flyte's connector server (`c0`) loads these: the Flyte 2 connector for the four scaling node types.
        "flyte.connectors": ["ddlscale=flytekitplugins_ddlscale.flyte2.connector"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "License :: OSI Approved :: Apache Software License",
        "Topic :: System :: Distributed Computing",
    ],
)
