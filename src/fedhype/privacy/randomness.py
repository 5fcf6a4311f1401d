"""The one rule for the randomness of a mechanism: OS entropy, unless a run seed makes it reproducible.

Every generator whose output a mechanism on private records uses (its Gaussian noise, its Poisson
batches), and every stream a command draws "from OS entropy unless ``--seed``", comes from
:func:`noise_generator`:

* ``seed is None`` — the generator is seeded with 63 bits from :func:`os.urandom` (like Opacus
  without ``secure_mode``: a fresh stream the run cannot replay; a rerun is charged again,
  :func:`fedhype.privacy.ledger.pending_charges`);
* ``seed`` given — a reproducible stream (tests, committed benchmark figures; a run records it as
  "not secure: reproducible noise"). With a ``salt`` ``(multiplier, offset)`` the stream's seed is
  ``(seed · multiplier + offset) mod 2⁶³`` (:func:`stream_seed`), so one run seed gives each
  client and each mechanism its own stream; without a salt the seed is used as it is.

The salts of the call sites are fixed (they define the seeded streams that tests and committed
figures reproduce bit for bit): the DP-SGD noise and sampling of a federated client
(:mod:`fedhype.federated.client`), the DP linear reference's clients
(:mod:`fedhype.prototypes.dp_linear`), the prototype classifier (:mod:`fedhype.prototypes.classifier`)
and synthetic sampling (:mod:`fedhype.synthesis.sample`, not a privacy parameter but the same rule).
"""

from __future__ import annotations

import numbers
import os
from typing import TYPE_CHECKING

from fedhype.errors import ValidationError

if TYPE_CHECKING:  # torch is imported on use (`--help` imports this package without it)
    import torch

#: stream seeds are reduced to 63 bits (a non-negative int64, what torch.Generator.manual_seed keeps)
SEED_MASK = (1 << 63) - 1


def entropy_seed(bits: int = 63) -> int:
    """A fresh seed of ``bits`` bits (1 ≤ bits ≤ 64) from :func:`os.urandom`; never reproducible."""
    if not (isinstance(bits, int) and 1 <= bits <= 64):
        raise ValidationError(f"entropy_seed: bits must be in [1, 64], got {bits!r}")
    return int.from_bytes(os.urandom(8), "little") & ((1 << bits) - 1)


def stream_seed(seed: int, *salt: int) -> int:
    """The seed of a salted stream: ``seed`` without a salt, else ``(seed · multiplier + offset) mod 2⁶³``.

    Args:
        seed: the run seed (int).
        salt: nothing, or ``(multiplier, offset)`` (ints) naming the stream.

    Raises:
        ValidationError: a salt of another length, or a non-integer seed or salt.
    """
    if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in (seed, *salt)):
        raise ValidationError(f"stream_seed takes integers, got seed={seed!r}, salt={salt!r}")
    seed, salt = int(seed), tuple(int(v) for v in salt)
    if not salt:
        return seed
    if len(salt) != 2:
        raise ValidationError(f"a stream salt is (multiplier, offset), got {salt!r}")
    return (seed * salt[0] + salt[1]) & SEED_MASK


def noise_generator(seed: int | None, *salt: int) -> "torch.Generator":
    """A CPU ``torch.Generator``: from OS entropy when ``seed`` is None, else seeded with
    :func:`stream_seed` ``(seed, *salt)`` (module docstring).

    Raises:
        ValidationError: as :func:`stream_seed`.
    """
    import torch

    return torch.Generator().manual_seed(entropy_seed() if seed is None else stream_seed(seed, *salt))
