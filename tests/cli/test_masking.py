"""Passwords in a database argument are masked in every message, whatever
the letter case of the keyword that carries them (``PASSWORD=``,
``SslPassword=``, a URL's ``?Password=``)."""

from __future__ import annotations

import pytest

from turnledger.cli._errors import display_db, scrub, secrets_of

SECRET = "kwSECRET"


@pytest.mark.parametrize(
    "db",
    [
        f"host=127.0.0.1 dbname=test PASSWORD={SECRET}",
        f"host=127.0.0.1 Password='{SECRET} with blanks' dbname=test",
        f"host=127.0.0.1 SSLPASSWORD={SECRET}",
        f"postgresql://127.0.0.1:1/test?user=postgres&PassWord={SECRET}",
    ],
)
def test_a_password_keyword_in_any_case_is_masked(db: str) -> None:
    shown = display_db(db)
    assert SECRET not in shown and "***" in shown
    # and a message that quotes the argument as given loses the password too
    message = f"cannot open {db}: refused"
    assert SECRET not in scrub(message, secrets_of(db))
