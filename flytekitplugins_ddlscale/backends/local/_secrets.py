"""A local cluster's secret files: random secrets and its own TLS authority, 0600 in its private folder.

A secret is read from its file (Ray's token, Spark's shared secret, the TLS key), never a command line or
an environment. Every local Dask cluster speaks ``tls://`` with mutual authentication, each member and
client presenting a certificate the cluster's own authority signed (its key never written); local Ray uses
the same files (:func:`~._ray_ops.tls_env`). docs/local.md, Security.
"""
import datetime
import ipaddress
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

from ..._core import settings
from ...errors import UnsafePathError
from .._support.privatefs import private_dir, read_text_nofollow

if TYPE_CHECKING:
    from distributed.security import Security

def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with a 0600 file holding ``data`` (atomically: readers see the old or the new
    file whole); its folder is made private (0700) and checked first."""
    folder = private_dir(path.parent)
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


def fresh_secret(path: Path) -> str:
    """A new random secret (256 bits, hex) written to ``path`` in place of any older one."""
    value = secrets.token_hex(32)
    write_private(path, value.encode("ascii"))
    return value


def kept_secret(path: Path) -> str:
    """The secret in ``path``, made (:func:`fresh_secret`) when there is none; a file that is a link,
    another user's or readable by others raises :class:`UnsafePathError`."""
    if not os.path.lexists(path):
        return fresh_secret(path)
    check_own_private_file(path)
    value = read_text_nofollow(path).strip()
    return value or fresh_secret(path)


def check_own_private_file(path: Path) -> None:
    """Refuse a secret file that is a link, not a regular file, another user's, or readable by others."""
    found = os.lstat(path)
    if os.path.islink(path) or not os.path.isfile(path) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise UnsafePathError(
            path, "a local cluster's secret file is a link, not a file, another user's or readable by others",
            "take the cluster down (`ddlscale local down`) and start it again",
        )


FOLDER = "tls"
"""The cluster's sub-folder of TLS files."""
TLS_DIR = "tls_dir"
"""``record.framework`` key: the cluster's folder of TLS files, for the calls given only a record."""
CA_FILE = "ca.pem"
CERT_FILE = "cluster.pem"
KEY_FILE = "cluster-key.pem"
VALID_DAYS = 3650
"""A local cluster may stay up for long; its certificate is worthless outside its 0700 folder anyway."""


@dataclass(frozen=True)
class DaskTls:
    """The paths of one cluster's TLS files."""

    ca_file: Path
    cert: Path
    key: Path

    @classmethod
    def of(cls, cluster_dir: Path) -> "DaskTls":
        """The files of the cluster whose folder is ``cluster_dir`` (whether they exist or not)."""
        folder = cluster_dir / FOLDER
        return cls(folder / CA_FILE, folder / CERT_FILE, folder / KEY_FILE)

    def exists(self) -> bool:
        """Whether all three files are there."""
        return all(os.path.lexists(path) for path in (self.ca_file, self.cert, self.key))

    def argv(self) -> List[str]:
        """The options ``dask scheduler`` and ``dask worker`` take them with."""
        return ["--tls-ca-file", str(self.ca_file), "--tls-cert", str(self.cert), "--tls-key", str(self.key)]

    def client_config(self) -> Dict[str, str]:
        """Dask's settings, as environment variables, under which ``Client("host:port")`` (or
        ``Client()`` with ``$DASK_SCHEDULER_ADDRESS``) connects with this certificate: ``tls`` as the
        default scheme, encryption required, the authority and the certificate with its key."""
        return {
            settings.DASK_DEFAULT_SCHEME.name: "tls",
            settings.DASK_REQUIRE_ENCRYPTION.name: "True",
            settings.DASK_TLS_CA_FILE.name: str(self.ca_file),
            settings.DASK_TLS_CLIENT_CERT.name: str(self.cert),
            settings.DASK_TLS_CLIENT_KEY.name: str(self.key),
        }

    def security(self) -> "Security":
        """A ``distributed.Security`` for this package's own connections to the cluster."""
        from distributed.security import Security

        return Security(
            tls_ca_file=str(self.ca_file), tls_client_cert=str(self.cert), tls_client_key=str(self.key),
            require_encryption=True,
        )


def tls_of(framework: Mapping[str, Any]) -> Optional[DaskTls]:
    """The TLS files a record's ``framework`` names (checked when the record was read); None for a head
    started by a version before TLS."""
    folder = framework.get(TLS_DIR)
    return DaskTls.of(Path(folder).parent) if folder else None


def ensure_tls(cluster_dir: Path) -> DaskTls:
    """The TLS files of the cluster in ``cluster_dir``, made (0600, in a 0700 ``tls/``) when missing.

    Existing files are kept, so workers and clients of a restarted scheduler keep
    working; a folder that is a link or another user's raises :class:`UnsafePathError`.
    """
    tls = DaskTls.of(cluster_dir)
    private_dir(tls.ca_file.parent)
    if tls.exists():
        for path in (tls.ca_file, tls.cert, tls.key):
            check_own_private_file(path)
        return tls
    ca_pem, cert_pem, key_pem = _issue()
    # The authority is written last: a start killed half-way leaves files that ``exists`` does not
    # take for a set, and the next start makes all three again.
    for path, data in ((tls.key, key_pem), (tls.cert, cert_pem), (tls.ca_file, ca_pem)):
        write_private(path, data)
    return tls


def _issue() -> "tuple[bytes, bytes, bytes]":
    """A new authority's certificate, and a certificate it signed with that certificate's key (PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid_from, valid_to = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ddlscale local Dask cluster CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from).not_valid_after(valid_to)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
        ), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ddlscale local Dask cluster")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from).not_valid_after(valid_to)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # Ray's gRPC (which uses these files too: ``_ray_ops.tls_env``) checks the address it dialled,
        # 127.0.0.1, against the certificate's names; Dask checks none.
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return ca_cert.public_bytes(pem), cert.public_bytes(pem), key_pem
