"""A batch of record writes, applied in one transaction by the store.

Services build a `Change` while they update the in-memory state and hand it to the store
once, so the state in memory and the state on disk move together. Values are encoded here,
at the moment they are put, by the record adapters of `bot.store.codec`.
"""

from __future__ import annotations

from typing import Any

from bot.store.codec import encode, encode_document


class Change:
    """A batch of writes applied in one transaction (`StateStore.apply`)."""

    def __init__(self) -> None:
        self.puts: list[tuple[str, str, str, str]] = []
        self.deletes: list[tuple[str, str, str]] = []
        self.clears: list[tuple[str, str]] = []
        # Wave documents live in a table of their own (`StateStore.wave` reads them).
        self.wave_puts: list[tuple[str, int, bytes]] = []
        self.wave_deletes: list[tuple[str, int]] = []
        self.wave_clears: list[str] = []
        # Repositories leaving the store (uninstalled). With replicas their lease passes to
        # the writer in the same transaction: the replica that kept one can no longer write
        # it back (the lease fence), and lets it go at its next round.
        self.dropped: list[str] = []

    def put(self, repo: str, kind: str, key: str | int, value: Any) -> Change:
        self.puts.append((repo, kind, str(key), encode(kind, value)))
        return self

    def delete(self, repo: str, kind: str, key: str | int) -> Change:
        self.deletes.append((repo, kind, str(key)))
        return self

    def clear(self, repo: str, kind: str) -> Change:
        """Delete every record of `kind`; puts of the same change are applied after."""
        self.clears.append((repo, kind))
        return self

    def drop_repo(self, repo: str) -> Change:
        """The repository leaves the store: its meta record goes (with what `clear` clears)."""
        self.dropped.append(repo)
        return self.delete("", "repo", repo)

    def put_wave(self, repo: str, number: int, document: Any) -> Change:
        self.wave_puts.append((repo, number, encode_document(document)))
        return self

    def delete_wave(self, repo: str, number: int) -> Change:
        self.wave_deletes.append((repo, number))
        return self

    def clear_waves(self, repo: str) -> Change:
        self.wave_clears.append(repo)
        return self

    def extend(self, other: Change) -> Change:
        self.puts.extend(other.puts)
        self.deletes.extend(other.deletes)
        self.clears.extend(other.clears)
        self.wave_puts.extend(other.wave_puts)
        self.wave_deletes.extend(other.wave_deletes)
        self.wave_clears.extend(other.wave_clears)
        self.dropped.extend(other.dropped)
        return self

    def __bool__(self) -> bool:
        return bool(self.puts or self.deletes or self.clears or self.wave_puts or self.wave_deletes or self.wave_clears)

    def written(self) -> set[str]:
        """The repositories the change puts records or waves of, lower-cased."""
        return {(repo or key).lower() for repo, _, key, _ in self.puts} | {repo.lower() for repo, _, _ in self.wave_puts}

    def repos(self) -> set[str]:
        """The repositories the change touches, lower-cased (a meta record counts as its repository's)."""
        touched = {repo or key for repo, _, key, _ in self.puts}
        touched.update(repo or key for repo, _, key in self.deletes)
        touched.update(repo for repo, _ in self.clears)
        touched.update(repo for repo, _, _ in self.wave_puts)
        touched.update(repo for repo, _ in self.wave_deletes)
        touched.update(self.wave_clears)
        return {name.lower() for name in touched}
