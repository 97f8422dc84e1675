"""What the openai provider says when the transport fails, against real servers on loopback.

A garbled stream event (a proxy's, a cut line) is an endpoint fault: retried,
not reported as a bug in substrat. A connection error names its cause (reset,
refused), which the SDK's "Connection error." alone does not. A TLS
certificate that fails verification is not retried (the same certificate will
fail again) and the error says how to trust a server of your own.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from substrat.errors import ProviderConfigError, ProviderUnavailableError
from substrat.providers.openai_chat import OpenAIProvider
from tests.support.chat_server import ChatServer, Reply, text
from tests.support.context import RecordingContext
from tests.support.openai_provider import make_provider, run, turn


def test_a_garbled_stream_event_is_retried_as_an_endpoint_fault() -> None:
    with ChatServer() as server:
        server.script(Reply(text="hello there", garbled_chunk=2), text("hello there"))
        provider, sleep = make_provider(server, max_retries=2)
        context = RecordingContext()

        async def main() -> str:
            session = await provider.create("m", "", context)
            response, _ = await turn(session, "hi")
            return response

        assert run(main()) == "hello there"
    assert len(server.requests) == 2 and len(sleep.delays) == 1
    [(_, retrying)] = [r for r in context.reports if r[0] == "turn.retrying"]
    assert retrying["error"] == "the endpoint sent a stream event that is not JSON " + (
        "(Expecting property name enclosed in double quotes)"
    )


async def one_turn(provider: OpenAIProvider) -> None:
    session = await provider.create("m", "", RecordingContext())
    await turn(session, "hi")


def test_a_refused_connection_says_so() -> None:
    with ChatServer() as server:
        pass  # stopped: nothing listens on its port any more
    provider, _ = make_provider(server, max_retries=1)
    with pytest.raises(ProviderUnavailableError) as failed:
        run(one_turn(provider))
    assert "APIConnectionError: Connection error. (" in str(failed.value)
    assert "Connect call failed" in str(failed.value) or "refused" in str(failed.value)


@pytest.fixture
def self_signed(tmp_path: Path) -> ssl.SSLContext:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def test_an_untrusted_certificate_is_not_retried_and_says_what_to_do(
    self_signed: ssl.SSLContext,
) -> None:
    with ChatServer(tls=self_signed) as server:
        provider, sleep = make_provider(server, max_retries=3)
        with pytest.raises(ProviderConfigError) as failed:
            run(one_turn(provider))
    message = str(failed.value)
    assert sleep.delays == [] and server.requests == []
    assert f"openai endpoint {server.base_url} model m: its TLS certificate is not trusted" in (
        message
    )
    assert "CERTIFICATE_VERIFY_FAILED" in message and "SSL_CERT_FILE" in message
