"""Secrets are masked in text, errors and log records."""
import logging

import pytest

from flytekitplugins_ddlscale import ScalingError
from flytekitplugins_ddlscale._core.redaction import MASK, RedactingFilter, install_redaction, redact, register_secret


@pytest.fixture(autouse=True)
def redacting():
    """Log redaction as every backend, phase, CLI command and connector starts it (never on import:
    tests/test_import_effects.py)."""
    install_redaction()


def test_registered_secrets_and_header_shapes_are_masked():
    register_secret("s3cr3t-value-1")
    assert redact("token s3cr3t-value-1 here") == f"token {MASK} here"
    assert MASK in redact("Authorization: Bearer abc.def.ghi") and "abc.def" not in redact("Authorization: Bearer abc.def.ghi")
    assert "k123" not in redact("X-Domino-Api-Key: k123456")
    assert "zzz9" not in redact('{"api_key": "zzz9zzz"}')
    register_secret("abc")  # too short to be a credential: masking it would mangle ordinary text
    assert redact("abc") == "abc"


def test_errors_mask_secrets_on_construction():
    register_secret("s3cr3t-value-2")
    error = ScalingError("failed with s3cr3t-value-2")
    assert "s3cr3t-value-2" not in str(error) and "s3cr3t-value-2" not in error.message


def test_plugin_logger_masks_messages(caplog):
    register_secret("s3cr3t-value-3")
    log = logging.getLogger("flytekitplugins_ddlscale")
    assert any(isinstance(f, RedactingFilter) for f in log.filters)
    with caplog.at_level(logging.INFO, logger="flytekitplugins_ddlscale"):
        log.info("calling with %s", "s3cr3t-value-3")
    assert "s3cr3t-value-3" not in caplog.text and MASK in caplog.text


@pytest.mark.parametrize("name", ["flytekitplugins_ddlscale.scaler", "flytekitplugins_ddlscale.kubernetes.client"])
def test_child_loggers_are_masked_too(caplog, name):
    register_secret("s3cr3t-value-4")
    with caplog.at_level(logging.INFO):
        logging.getLogger(name).warning("header X-Domino-Api-Key %s", "s3cr3t-value-4")
        logging.getLogger("some.other.library").warning("untouched %s", "s3cr3t-value-4")
    assert [r.getMessage() for r in caplog.records] == [
        f"header X-Domino-Api-Key {MASK}",
        "untouched s3cr3t-value-4",
    ]
