"""Why a store could not be opened, in one line a person can act on."""

from __future__ import annotations


class StoreError(Exception):
    """The store cannot be used; the message says why in one line."""


class StoreUnavailable(StoreError):
    """The store did not do what was asked this time (connection lost, server restarting,
    a lock or a statement timed out): trying again later can succeed."""

    transient = True


class StoreLocked(StoreError):
    """Another Klaud process serves the same SQLite file."""


# The SQLSTATE (a class of Klaud's own) the lease fence raises (PostgreSQL, migration 7).
LEASE_TAKEN_SQLSTATE = "KL001"


class LeaseTaken(StoreError):
    """A write of repositories another replica has taken since was refused (replicas).

    Transient: the refusal may come from this replica's own clock alone (a stall past
    most of its lease, before the lease expired), and its next round renews the lease. A
    delivery refused so is tried again: failed, it was never processed although nobody
    else could have taken it; if another replica did take its repository, the claim fence
    refuses this replica's commit of it anyway, and the new owner processes it."""

    transient = True


class SchemaTooNew(StoreError):
    """The store was migrated by a newer Klaud than this one."""
