"""`ssdemu ctl`: an nvme-cli-like admin tool against a running daemon."""

from __future__ import annotations

import json

import hostlib
from ssdemu.units import format_size


def _request(args, msg: dict) -> dict:
    return hostlib.control_request(args.socket, msg, owner_key_file=args.owner_key_file)


def fault(args) -> tuple[dict, str]:
    """`ctl fault ...`: on a connection of its own with no queue pair, so that it also works
    while the device is removed."""
    action = args.fault
    if action in ("read-error", "write-error", "latency"):
        msg = {"op": "fault", "action": "add", "kind": action, "nsid": args.nsid,
               "count": args.count, "probability": args.probability, "seed": args.seed}
        if args.lba is not None:
            msg["lba"] = list(args.lba)
        if args.key is not None:
            msg["key"] = args.key
        if action == "latency":
            msg["latency_us"] = args.us
            msg["directions"] = args.directions
        data = {"id": _request(args, msg)["id"]}
        return data, f"fault rule {data['id']} injected"
    if action == "clear":
        reply = _request(args, {"op": "fault", "action": "clear", "id": args.id})
        return {"cleared": reply["cleared"]}, f"cleared {reply['cleared']} fault rules"
    if action == "list":
        rules = _request(args, {"op": "fault", "action": "list"})["rules"]
        text = "\n".join(" ".join(f"{k}={v}" for k, v in r.items()) for r in rules)
        return {"rules": rules}, text or "no fault rules"
    if action == "remove":
        _request(args, {"op": "fault", "action": "remove", "seconds": args.seconds})
        return {"removed": True}, "the device is removed"
    if action == "power-cut":
        _request(args, {"op": "fault", "action": "power-cut", "seed": args.seed})
        return {"power_cut": True}, "power cut: the drive powers on again"
    was = hostlib.reinsert(args.socket, owner_key_file=args.owner_key_file)
    return {"was_removed": was}, "the device is back" if was else "the device was not removed"


def _whose(ns: dict) -> str:
    """shared / yours; an admin's list also has others' namespaces, by their uid."""
    if ns["shared"]:
        return "shared"
    return "yours" if ns.get("mine", True) else f"uid {ns['uid']}"


def run(args) -> str:
    """One ctl action (args: the parsed command line); the text or JSON to print."""
    action, as_json = args.ctl, args.json
    if action == "fault":
        data, text = fault(args)
        return json.dumps(data) if as_json else text
    with hostlib.connect(args.socket, entries=8, owner_key_file=args.owner_key_file) as dev:
        if action == "identify":
            data = dev.identify()
            text = "\n".join(f"{k:<22}{v}" for k, v in data.items())
        elif action == "ns-list":
            data = dev.namespaces(all_owners=args.all_owners)
            rows = [f"{'nsid':>5}  {'size':>10}  {'start':>14}  owner"]
            rows += [f"{n['nsid']:>5}  {format_size(n['bytes']):>10}  {n['start']:>14}  "
                     f"{_whose(n)}" for n in data]
            text = "\n".join(rows)
        elif action == "ns-create":
            data = {"nsid": dev.ns_create(args.size, shared=args.shared)}
            text = f"created namespace {data['nsid']}"
        elif action == "ns-delete":
            dev.ns_delete(args.nsid, any_owner=args.any_owner)
            data = {"deleted": args.nsid}
            text = f"deleted namespace {args.nsid}"
        else:  # log
            data = dev.log(args.page)
            rows = [f"{'class':<8}{'commands':>10}{'errors':>8}{'bytes':>14}{'copied':>12}"
                    f"{'mean us':>10}"]
            for name, c in data["classes"].items():
                rows.append(f"{name:<8}{c['commands']:>10}{c['errors']:>8}{c['bytes']:>14}"
                            f"{c['bytes_copied']:>12}{c['mean_latency_ns'] / 1000:>10.1f}")
            rows.append(f"broken queues {data['broken_queues']}, sleeps {data['sleeps']}, "
                        f"wakeups {data['wakeups']}")
            text = "\n".join(rows)
    return json.dumps(data) if as_json else text
