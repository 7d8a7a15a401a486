"""The HTTP session the OTLP/HTTP exporters get when a CA certificate is configured.

``requests`` lets ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` in the environment win
over a session's own ``verify``; the OTLP/HTTP exporter puts the standard
``OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]CERTIFICATE`` there, so on machines that set
those variables (many images do) the Collector's CA was silently ignored and TLS
failed. This session keeps the configured certificate; proxies and everything else
still come from the environment.

Usage::

    OTLPSpanExporter(session=otlp_session("TRACES"))  # None: the exporter's default
"""

from __future__ import annotations

import os
from typing import Any


def otlp_session(signal: str) -> Any:
    """A session honouring the OTLP certificate for ``signal`` (TRACES, METRICS), or None."""
    if not (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_CERTIFICATE")
        or os.environ.get("OTEL_EXPORTER_OTLP_CERTIFICATE")
    ):
        return None
    import requests

    class CertificateSession(requests.Session):
        def merge_environment_settings(
            self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any
        ) -> Any:
            merged = super().merge_environment_settings(url, proxies, stream, verify, cert)
            if verify is None and isinstance(self.verify, str):
                merged["verify"] = self.verify  # the exporter set it from the OTLP variable
            return merged

    return CertificateSession()
