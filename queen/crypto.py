"""AES-256-GCM for payloads of queues with encryptionEnabled."""

from __future__ import annotations

import base64
import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from queen.errors import InvalidInput

NONCE_BYTES = 12
TAG_BYTES = 16


def load_key(hex_key: str) -> bytes:
    """Parse QUEEN_ENCRYPTION_KEY (64 hex characters)."""
    try:
        key = bytes.fromhex(hex_key)
    except ValueError as exc:
        raise InvalidInput("QUEEN_ENCRYPTION_KEY must be 64 hex characters") from exc
    if len(key) != 32:
        raise InvalidInput("QUEEN_ENCRYPTION_KEY must be 64 hex characters")
    return key


def encrypt(key: bytes, plaintext: bytes) -> dict[str, str]:
    """Encrypt plaintext into a JSON-safe envelope {iv, tag, data}."""
    iv = os.urandom(NONCE_BYTES)
    sealed = AESGCM(key).encrypt(iv, plaintext, None)
    return {
        "iv": base64.b64encode(iv).decode(),
        "tag": base64.b64encode(sealed[-TAG_BYTES:]).decode(),
        "data": base64.b64encode(sealed[:-TAG_BYTES]).decode(),
    }


def decrypt(key: bytes, envelope: dict[str, str]) -> bytes:
    """Open an envelope made by encrypt()."""
    iv = base64.b64decode(envelope["iv"])
    sealed = base64.b64decode(envelope["data"]) + base64.b64decode(envelope["tag"])
    return AESGCM(key).decrypt(iv, sealed, None)
