"""Hourly cost of a job from the dated price table `vm_prices.csv` (see its header for the source).

Prices differ by region, so the table has a row per (region, size) and a job is priced in its stack's
region; where the table has no figure for that region the line says so and names the region it used.
`python -m launcher.prices --refresh REGION` writes that region's rows from the public Azure Retail Prices
API (needs internet access to prices.azure.com; not reachable from this project's CI), keeping the others.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import pathlib
import sys
import urllib.parse
import urllib.request

TABLE = pathlib.Path(__file__).with_name("vm_prices.csv")
FIELDS = ("region", "vm_size", "dedicated", "low_priority")
API = "https://prices.azure.com/api/retail/prices"

Prices = dict[tuple[str, str], tuple[float, float | None]]  # (region, vm_size) -> (dedicated, spot or None)


def table(path: pathlib.Path = TABLE) -> tuple[str, Prices]:
    lines = path.read_text().splitlines()
    header = "\n".join(line[2:] for line in lines if line.startswith("#"))
    rows = csv.DictReader(line for line in lines if not line.startswith("#"))
    prices = {
        (r["region"], r["vm_size"]): (float(r["dedicated"]), float(r["low_priority"]) if r["low_priority"] else None)
        for r in rows
    }
    return header, prices


def hourly(
    vm_size: str, nodes: int, low_priority: bool, region: str | None, path: pathlib.Path = TABLE
) -> tuple[float | None, str]:
    """(USD per hour for the job's nodes or None, a line saying where the number comes from)."""
    header, prices = table(path)
    source = header.splitlines()[0] if header else path.name
    regions = sorted({r for r, size in prices if size == vm_size})
    if not regions:
        return None, (
            f"no price for {vm_size} in launcher/vm_prices.csv (any region): add it with "
            f"`python -m launcher.prices --refresh {region or 'REGION'}` where prices.azure.com is reachable"
        )
    used = region if region in regions else regions[0]
    dedicated, spot = prices[(used, vm_size)]
    price = spot if low_priority and spot is not None else dedicated
    kind = "low priority" if low_priority and spot is not None else "dedicated"
    line = f"{nodes} x {vm_size} ({kind}) at ${price:.3f}/node-hour in {used}; {source}"
    if used != region:
        # A price from another region can be off by tens of percent: say so on the same line.
        line += (
            f" -- NOT the stack's region ({region or 'unknown: the stack outputs have no location'}); "
            f"refresh with `python -m launcher.prices --refresh {region or 'REGION'}`"
        )
    return nodes * price, line


def parse_api(items: list[dict]) -> tuple[float | None, float | None]:
    """(pay-as-you-go, spot/low-priority) Linux price per hour from Retail Prices API items of one size."""
    linux = [i for i in items if "Windows" not in i["productName"] and i.get("type", "Consumption") == "Consumption"]
    normal = [i["retailPrice"] for i in linux if "Spot" not in i["skuName"] and "Low Priority" not in i["skuName"]]
    spot = [i["retailPrice"] for i in linux if "Spot" in i["skuName"] or "Low Priority" in i["skuName"]]
    return (min(normal) if normal else None), (min(spot) if spot else None)


def _fetch(region: str, size: str) -> list[dict]:
    query = f"armRegionName eq '{region}' and armSkuName eq '{size}' and priceType eq 'Consumption'"
    url = f"{API}?$filter=" + urllib.parse.quote(query)
    items = []
    while url:  # the API pages its answers (NextPageLink)
        page = json.load(urllib.request.urlopen(url, timeout=30))
        items += page.get("Items", [])
        url = page.get("NextPageLink")
    return items


def refresh(region: str, path: pathlib.Path = TABLE, fetch=_fetch) -> str:
    """The table with `region`'s rows fetched for every size the table knows; other regions kept."""
    header, prices = table(path)
    sizes = sorted({size for _, size in prices})
    fresh = {}
    for size in sizes:
        normal, spot = parse_api(fetch(region, size))
        if normal is not None:
            fresh[(region, size)] = (normal, spot)
    kept = {k: v for k, v in prices.items() if k[0] != region}
    out = io.StringIO()
    notes = [line for line in header.splitlines() if not line.startswith(f"{region}: fetched")]
    out.write("".join(f"# {line}\n" for line in notes))
    out.write(
        f"# {region}: fetched from the Azure Retail Prices API by `python -m launcher.prices --refresh {region}`.\n"
    )
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIELDS)
    for (reg, size), (normal, spot) in sorted({**kept, **fresh}.items()):
        writer.writerow([reg, size, f"{normal:.3f}", "" if spot is None else f"{spot:.3f}"])
    return out.getvalue()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refresh", metavar="REGION", required=True, help="Azure region short name, e.g. westeurope")
    TABLE.write_text(refresh(ap.parse_args().refresh))
    print(f"wrote {TABLE}", file=sys.stderr)
