"""Certificates made for a test with the openssl command: a CA, and a certificate it signed for
127.0.0.1 (server and client use), each with its key. Short-lived; never leave the test's folder."""

from __future__ import annotations

import pathlib
import subprocess
from dataclasses import dataclass

_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class TlsFiles:
    ca: pathlib.Path
    cert: pathlib.Path
    key: pathlib.Path


def make_tls_files(folder: pathlib.Path, name: str = "127.0.0.1") -> TlsFiles:
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.crt", folder / "ca.key"
    cert, key, request = folder / f"{name}.crt", folder / f"{name}.key", folder / f"{name}.csr"
    ext = folder / "san.ext"
    ext.write_text(f"subjectAltName=IP:{name}\nextendedKeyUsage=serverAuth,clientAuth\n")

    def run(*argv: str) -> None:
        subprocess.run(["openssl", *argv], check=True, capture_output=True)

    run("req", "-x509", *_KEY, "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", "/CN=ringmaster-test-ca")
    run("req", *_KEY, "-keyout", str(key), "-out", str(request), "-subj", f"/CN={name}")
    run("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return TlsFiles(ca, cert, key)
