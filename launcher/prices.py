"""Hourly cost of a job from the dated price table `vm_prices.csv` (see its header for the source).

`python -m launcher.prices --refresh REGION` rewrites the table from the public Azure Retail Prices API
(needs internet access to prices.azure.com; not reachable from this project's CI).
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


def table(path: pathlib.Path = TABLE) -> tuple[str, dict[str, tuple[float, float | None]]]:
    lines = path.read_text().splitlines()
    header = "\n".join(line[2:] for line in lines if line.startswith("#"))
    rows = csv.DictReader(line for line in lines if not line.startswith("#"))
    prices = {r["vm_size"]: (float(r["dedicated"]), float(r["low_priority"]) if r["low_priority"] else None)
              for r in rows}
    return header, prices


def hourly(vm_size: str, nodes: int, low_priority: bool) -> tuple[float | None, str]:
    """(USD per hour for the job's nodes or None, a line saying where the number comes from)."""
    header, prices = table()
    source = header.splitlines()[0] if header else "vm_prices.csv"
    if vm_size not in prices:
        return None, f"no price for {vm_size} in launcher/vm_prices.csv"
    dedicated, spot = prices[vm_size]
    price = spot if low_priority and spot is not None else dedicated
    kind = "low priority" if low_priority and spot is not None else "dedicated"
    return nodes * price, f"{nodes} x {vm_size} ({kind}) at ${price:.3f}/node-hour; {source}"


def refresh(region: str) -> str:
    _, prices = table()
    out = io.StringIO()
    out.write(f"# Pay-as-you-go Linux prices, USD per node-hour, {region}, from the Azure Retail Prices API.\n")
    out.write("vm_size,dedicated,low_priority\n")
    for size in prices:
        arm = size
        query = f"armRegionName eq '{region}' and armSkuName eq '{arm}' and priceType eq 'Consumption'"
        url = "https://prices.azure.com/api/retail/prices?$filter=" + urllib.parse.quote(query)
        items = json.load(urllib.request.urlopen(url, timeout=30)).get("Items", [])
        linux = [i for i in items if "Windows" not in i["productName"]]
        normal = [i["retailPrice"] for i in linux if "Spot" not in i["skuName"] and "Low Priority" not in i["skuName"]]
        spot = [i["retailPrice"] for i in linux if "Spot" in i["skuName"] or "Low Priority" in i["skuName"]]
        out.write(f"{size},{min(normal) if normal else ''},{min(spot) if spot else ''}\n")
    return out.getvalue()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refresh", metavar="REGION", required=True)
    TABLE.write_text(refresh(ap.parse_args().refresh))
    print(f"wrote {TABLE}", file=sys.stderr)
