"""``redact_dsn``: what ``snapshot --from tidb`` keeps of its DSN in messages and in the job state (shown by
``status --json``) — never a password, in any of the forms Connector/J takes one."""

from __future__ import annotations

import pytest

from ticdc_delta.snapshot.jdbc import redact_dsn


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("jdbc:mysql://tidb:4000/?user=cdc&password=S3CR3T", "jdbc:mysql://tidb:4000/?user=cdc&password=***"),
        # Connector/J's user:password@host form
        ("jdbc:mysql://cdc:S3CR3T@tidb:4000/", "jdbc:mysql://***@tidb:4000/"),
        ("jdbc:mysql://cdc:S3C/R3T@tidb:4000/shop?useSSL=true", "jdbc:mysql://***@tidb:4000/shop?useSSL=true"),
        # multi-factor passwords and key-store passwords are properties too
        ("jdbc:mysql://tidb:4000/?user=cdc&password1=S3CR3T&password2=S3CR3T2",
         "jdbc:mysql://tidb:4000/?user=cdc&password1=***&password2=***"),
        ("jdbc:mysql://tidb:4000/?user=cdc&trustCertificateKeyStorePassword=S3CR3T",
         "jdbc:mysql://tidb:4000/?user=cdc&trustCertificateKeyStorePassword=***"),
        # nothing to hide: unchanged (an @ in a property is not user info)
        ("jdbc:mysql://tidb:4000/shop?user=cdc@corp", "jdbc:mysql://tidb:4000/shop?user=cdc@corp"),
    ],
)
def test_redact_dsn_hides_every_password(dsn: str, shown: str) -> None:
    assert redact_dsn(dsn) == shown
    assert "S3C" not in redact_dsn(dsn)
