"""The admin API answers alike on both store engines."""

from __future__ import annotations

import aiohttp

from tests import scenarios as sc
from tests.harness import sandbox_stack


async def odd_delivery_ids_are_not_found(tmp_path, env: dict[str, str]) -> None:
    # The id went to the store as it came: PostgreSQL's text refuses a NUL (SQLite does
    # not), so `%00` in the path was a 500 and a traceback there, a 404 on SQLite.
    async with sandbox_stack(tmp_path, sc.scenario(), env=env) as run, aiohttp.ClientSession() as session:
        for path in ("a%00b", "a" * 201):
            async with session.get(f"{run.admin_url}/api/v1/deliveries/{path}") as answer:
                assert answer.status == 404, await answer.text()


async def test_a_delivery_id_no_webhook_could_store_is_404_on_sqlite(tmp_path):
    await odd_delivery_ids_are_not_found(tmp_path, {})


async def test_a_delivery_id_no_webhook_could_store_is_404_on_postgresql(tmp_path, store_url):
    await odd_delivery_ids_are_not_found(tmp_path, {"KLAUD_DB": store_url})
