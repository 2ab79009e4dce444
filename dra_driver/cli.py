"""`dra-driver` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_driver import jsonlog
from dra_driver.allocation.cli import add_subcommand as add_simulate_subcommand
from dra_driver.api.slice import ResourceSlice
from dra_driver.cel.cli import add_subcommand as add_cel_subcommand
from dra_driver.health.monitor import DEFAULT_IGNORED_XIDS
from dra_driver.nvml.discovery import DiscoveryError, discover
from dra_driver.nvml.inventory import Inventory
from dra_driver.plugin import features
from dra_driver.plugin.grpc import probe as probe_cli
from dra_driver.plugin.sockets import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR, add_pod_uid_argument
from dra_driver.report.cli import add_subcommand as add_report_subcommand
from dra_driver.simulator.source import open_source, serve_containers
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from dra_driver.slices.builder import PublishMode, SliceLimitError, build_slices, check_numa_form
from dra_driver.slices.devices import DEFAULT_MODE, NumaNodeForm, parse_mig_profiles, parse_replicas

HEALTH_SOCKET_ENV = "DRA_DRIVER_HEALTH_SOCKET"  # `health --socket` default, for a daemon with another --plugin-dir


def _add_nvml_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--sim", metavar="MACHINE", help="use a simulated machine (see `dra-driver sim list`)")
    src.add_argument("--nvml", action="store_true", help="use the real NVML library (default)")
    p.add_argument("--sim-state", type=Path, help="simulator state directory (shared by processes)")
    p.add_argument("--sysfs-root", type=Path, default=Path("/sys"), help="sysfs for PCIe topology (real NVML)")
    p.add_argument("--proc-root", type=Path, default=Path("/proc"), help="procfs for device majors and MIG caps")
    p.add_argument(
        "--driver-root",
        type=Path,
        help="the NVIDIA driver's files (libraries, nvidia-smi, firmware) as this process sees them "
        "(default: /; with --sim, the simulated machine's own driver root)",
    )
    p.add_argument(
        "--host-driver-root",
        type=Path,
        help="the same directory as the host sees it, for the paths in CDI specs (default: --driver-root)",
    )


def _add_slice_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--k8s-version", default="1.35", help="target Kubernetes version (1.34..1.37; a newer one gets 1.37's layout)"
    )
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME") or socket.gethostname())
    p.add_argument("--driver", default=DEFAULT_DRIVER_NAME, help="driver name (a DNS subdomain)")
    p.add_argument(
        "--mode",
        choices=[m.value for m in PublishMode],
        default=DEFAULT_MODE.value,
        help="partitionable: GPUs + MIG partitions carved on demand; static: existing MIG devices; "
        "gpus: whole GPUs only; shared: whole GPUs several claims hold at once",
    )
    p.add_argument(
        "--replicas",
        type=_replicas,
        default=None,
        help="with --mode shared: N claims per GPU, each taking one share and no memory unless it asks, or "
        "'unlimited' (the device plugin's time-slicing replicas); default: claims share a GPU by memory",
    )
    p.add_argument(
        "--mig-profiles",
        type=_mig_profiles,
        default=None,
        help="with --mode partitionable: publish only these MIG profiles' partitions (comma-separated, e.g. "
        "1g.10gb,3g.40gb): fewer devices cost the scheduler less on every node it tries; default: every profile",
    )
    p.add_argument(
        "--numa-node-form",
        choices=[f.value for f in NumaNodeForm],
        default=NumaNodeForm.SCALAR.value,
        help="list: publish the NUMA node attribute as a list (`ints`) of the GPU's node and its socket's nodes as "
        "close to it (sub-NUMA clustering), for matchAttribute across them; needs the DRAListTypeAttributes gate "
        "(alpha, 1.36+) on the API server and scheduler, which reject the slices without it. Default: scalar",
    )


def _mig_profiles(text: str) -> frozenset[str] | None:
    try:
        return parse_mig_profiles(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _replicas(text: str) -> int:
    try:
        return parse_replicas(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _discover(args: argparse.Namespace) -> Inventory:
    source = open_source(args.sim, args.sim_state, args.sysfs_root)
    logging.getLogger(__name__).info("discovering through %s", source.description)
    return discover(source.lib, source.sysfs_root)


def _slices(args: argparse.Namespace, inv: Inventory) -> list[ResourceSlice]:
    return build_slices(
        inv,
        node_name=args.node_name,
        driver=args.driver,
        k8s_version=args.k8s_version,
        mode=PublishMode(args.mode),
        replicas=args.replicas,
        mig_profiles=args.mig_profiles,
        numa_form=NumaNodeForm(args.numa_node_form),
    )


def _print_table(inv: Inventory, slices: list[ResourceSlice]) -> None:
    print(f"driver {inv.driver_version}, CUDA {inv.cuda_driver_version}, {len(inv.gpus)} GPUs")
    print(f"{'minor':>5}  {'product':<24} {'memory':>10}  {'MIG':<9} {'PCI':<13} {'root':<11} profiles")
    for g in inv.gpus:
        mig = "on" if g.mig_enabled else ("off" if g.mig_capable else "-")
        if g.mig_pending != g.mig_enabled:
            mig += "->" + ("on" if g.mig_pending else "off")
        profiles = ", ".join(p.name for p in g.mig_profiles) or "-"
        print(
            f"{g.minor:>5}  {g.product_name:<24} {g.memory_bytes >> 30:>7}GiB  {mig:<9} {g.pci_bus_id:<13} "
            f"{g.pcie_root or '-':<11} {profiles}"
        )
    n_dev = sum(len(s.spec.devices or []) for s in slices)
    n_sets = sum(len(s.spec.shared_counters or []) for s in slices)
    print(f"\n{len(slices)} ResourceSlices, {n_dev} devices, {n_sets} counter sets")
    for s in slices:
        devices = s.spec.devices or []
        kinds: dict[str, int] = {}
        for d in devices:
            t = str(d.attributes["type"].value())
            kinds[t] = kinds.get(t, 0) + 1
        what = (
            ", ".join(f"{n} {k}" for k, n in kinds.items())
            or f"counter sets {', '.join(c.name for c in s.spec.shared_counters or [])}"
        )
        print(f"  {s.metadata.name}: {what}")


def cmd_inventory(args: argparse.Namespace) -> int:
    inv = _discover(args)
    slices = _slices(args, inv)
    if args.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": [s.to_api() for s in slices]}, indent=2))
    elif args.output == "yaml":
        import yaml  # only here: `dra-driver plugin` starts faster without it

        print(yaml.safe_dump_all([s.to_api() for s in slices], sort_keys=False), end="")
    elif args.output == "inventory":
        print(inv.model_dump_json(indent=2))
    else:
        _print_table(inv, slices)
    return 0


def cmd_sim_list(args: argparse.Namespace) -> int:
    from dra_driver.simulator.catalog import machine, machine_names, product

    for name in machine_names():
        m = machine(name)
        products = sorted({product(g.product).name for g in m.gpus})
        print(f"{name:<10} {len(m.gpus)} GPUs  {m.description}  [{', '.join(products)}]")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from dra_driver.demo import run_cluster_demo, run_demo

    if args.kubeconfig is not None:
        return run_cluster_demo(args.kubeconfig, args.driver)
    return run_demo(args.sim, args.driver)


def _xid_list(text: str) -> frozenset[int]:
    try:
        xids = frozenset(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of XID numbers: {text!r}") from None
    if any(x <= 0 for x in xids):
        raise argparse.ArgumentTypeError(f"XIDs are positive numbers: {text!r}")
    return xids


def cmd_plugin(args: argparse.Namespace) -> int:
    from dra_driver.daemon import DaemonOptions, run
    from dra_driver.plugin.driver import PluginSettings
    from dra_driver.plugin.sockets import check_pod_uid

    check_pod_uid(args.pod_uid)  # before discovery and recovery, not after
    if args.k8s_version:  # else once the API server has said its version (daemon.run)
        check_numa_form(NumaNodeForm(args.numa_node_form), args.k8s_version)
    settings = PluginSettings(
        driver=args.driver,
        pool=args.node_name,
        plugin_dir=args.plugin_dir or DEFAULT_PLUGINS_DIR / args.driver,
        cdi_root=args.cdi_root,
        mode=PublishMode(args.mode),
        mig_profiles=args.mig_profiles,
        feature_gates=features.parse(args.feature_gates),
        cdi_hook_path=args.cdi_hook_path,
    )
    options = DaemonOptions(
        settings,
        args.registry_dir,
        args.kubeconfig,
        args.metrics_port,
        args.k8s_version,
        args.rediscover_seconds,
        args.node_labels,
        args.ignored_xids,
        metrics_address=args.metrics_address,
        metrics_share_port=args.metrics_share_port,
        pod_uid=args.pod_uid,
        replicas=args.replicas,
        node_configs=args.node_configs,
        node_config_label=args.node_config_label,
        numa_form=NumaNodeForm(args.numa_node_form),
    )
    machine, sim_state, host_driver_root = args.sim, args.sim_state, args.host_driver_root
    if machine:
        from dra_driver.simulator.nodemachine import for_machine, machine_of_node

        if args.sim_machine_label:
            machine = machine_of_node(machine, args.sim_machine_label, args.node_name, args.kubeconfig)
        sim_state, host_driver_root = for_machine(sim_state, machine), for_machine(host_driver_root, machine)
    source = open_source(machine, sim_state, args.sysfs_root, args.proc_root, args.driver_root, host_driver_root)
    if args.sim and args.sim_persistenced:
        serve_containers(source)
    run(options, source)
    return 0


def _health_socket(args: argparse.Namespace) -> Path:
    from dra_driver.health.admin import SOCKET_NAME

    if args.socket:
        return Path(args.socket)
    if os.environ.get(HEALTH_SOCKET_ENV):
        return Path(os.environ[HEALTH_SOCKET_ENV])
    return DEFAULT_PLUGINS_DIR / str(args.driver) / SOCKET_NAME


def _print_health(report: dict[str, Any]) -> None:
    devices: dict[str, Any] = report.get("devices") or {}
    if not devices:
        print("no device is tainted")
    for name, state in devices.items():
        taints = ", ".join(
            f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t['effect']}" for t in state.get("taints", [])
        )
        print(f"{name}: {taints}")
        for i in state.get("incidents", []):
            what = f"{i['kind']} {i['value']}" if i.get("value") else i["kind"]
            note = "clearable" if i.get("clearable") else "clears by itself"
            seen = f", {i['count']} times, last {i['lastSeen']}" if i.get("count", 1) > 1 else ""
            print(f"    {what} on GPU {i['gpu']} since {i['since']}{seen} ({note})")
    for title, key in (("lost GPUs", "lostGPUs"), ("unmonitored GPUs", "unmonitoredGPUs")):
        gpus = report.get(key) or []
        listed = ", ".join(
            f"{g['device'] or '?'} ({g['uuid']}{': ' + g['reason'] if g.get('reason') else ''})" for g in gpus
        )
        print(f"{title}: {listed or 'none'}")


def cmd_health_status(args: argparse.Namespace) -> int:
    from dra_driver.health.admin import AdminError, request

    try:
        report = request(_health_socket(args), "GET", "/health")
    except AdminError as e:
        print(f"dra-driver: error: {e}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(report, indent=2))
    else:
        _print_health(report)
    return 0


def cmd_health_clear(args: argparse.Namespace) -> int:
    from dra_driver.health.admin import AdminError, request

    try:
        answer = request(_health_socket(args), "POST", "/health/clear", {"device": args.device})
    except AdminError as e:
        print(f"dra-driver: error: {e}", file=sys.stderr)
        return 1
    cleared = int(answer.get("cleared", 0))
    if cleared:
        print(f"{answer.get('device')}: cleared {cleared} incident(s); its taints are removed on the next publish")
    else:
        print(f"{answer.get('device')}: no XID or ECC incident to clear")
    return 0


def cmd_webhook(args: argparse.Namespace) -> int:
    from dra_driver.webhook.server import run
    from dra_driver.webhook.tls import TlsError

    try:
        run(args.driver, args.tls_cert, args.tls_key, args.bind, args.port)
    except (TlsError, OSError) as e:  # no certificate, or the port is taken
        print(f"dra-driver: error: {e}", file=sys.stderr)
        return 1
    return 0


def _add_webhook_subcommand(sub: Any) -> None:
    webhook = sub.add_parser(
        "webhook", help="validating admission webhook: this driver's opaque configs in ResourceClaims (HTTPS)"
    )
    webhook.add_argument("--tls-cert", type=Path, required=True, help="PEM certificate (chain); reloaded on change")
    webhook.add_argument("--tls-key", type=Path, required=True, help="PEM private key of --tls-cert")
    webhook.add_argument("--port", type=int, default=8443)
    webhook.add_argument("--bind", default="0.0.0.0", help="address to listen on (:: for IPv6)")
    webhook.add_argument("--driver", default=DEFAULT_DRIVER_NAME, help="driver name whose configs are checked")
    webhook.set_defaults(func=cmd_webhook)


def cmd_mps_control_daemon(args: argparse.Namespace) -> int:
    from dra_driver.sharing.mps_control_daemon import MpsSettings, run

    settings = MpsSettings(args.active_thread_percentage, tuple(args.pinned_mem_limit))
    return run(args.driver_root, settings, args.ready_file, start_timeout=args.start_timeout)


def _pinned_mem_limit(text: str) -> tuple[int, str]:
    from dra_driver.sharing.mps_control_daemon import parse_pinned

    try:
        return parse_pinned(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_mps_control_daemon_subcommand(sub: Any) -> None:
    mps = sub.add_parser(
        "mps-control-daemon",
        help="a claim's MPS control daemon in the foreground, set up (the main process of its pod; "
        "CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY and CUDA_VISIBLE_DEVICES from the environment)",
    )
    mps.add_argument("--driver-root", type=Path, default=Path("/"), help="holds usr/bin/nvidia-cuda-mps-control")
    mps.add_argument("--ready-file", type=Path, required=True, help="written once the daemon runs with its settings")
    mps.add_argument("--active-thread-percentage", type=int, help="set_default_active_thread_percentage")
    mps.add_argument(
        "--pinned-mem-limit",
        type=_pinned_mem_limit,
        action="append",
        default=[],
        metavar="INDEX=LIMIT",
        help="set_default_device_pinned_mem_limit, e.g. 0=1024M (repeatable)",
    )
    mps.add_argument("--start-timeout", type=float, default=60.0, help="seconds for the daemon to answer")
    mps.set_defaults(func=cmd_mps_control_daemon)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dra-driver", description=__doc__)
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command", required=True)
    add_cel_subcommand(sub)
    add_simulate_subcommand(sub)
    _add_webhook_subcommand(sub)
    _add_mps_control_daemon_subcommand(sub)
    add_report_subcommand(sub)

    inv = sub.add_parser("inventory", help="discover GPUs and print this node's ResourceSlices")
    _add_nvml_args(inv)
    _add_slice_args(inv)
    inv.add_argument("-o", "--output", choices=["yaml", "json", "table", "inventory"], default="yaml")
    inv.set_defaults(func=cmd_inventory)

    demo = sub.add_parser("demo", help="the whole flow on a built-in simulated node (no GPU, no cluster)")
    demo.add_argument("--sim", default="dgx-h100", metavar="MACHINE")
    demo.add_argument("--kubeconfig", type=Path, help="run against this cluster, where the driver is deployed")
    demo.add_argument("--driver", default=DEFAULT_DRIVER_NAME, help="driver name (a DNS subdomain)")
    demo.set_defaults(func=cmd_demo)

    plugin = sub.add_parser("plugin", help="run this node's publisher and kubelet plugin until SIGTERM")
    _add_nvml_args(plugin)
    _add_slice_args(plugin)
    plugin.add_argument("--kubeconfig", type=Path, help="default: in-cluster service account")
    plugin.add_argument("--plugin-dir", type=Path, help="default /var/lib/kubelet/plugins/<driver>")
    plugin.add_argument("--registry-dir", type=Path, default=DEFAULT_REGISTRY_DIR)
    plugin.add_argument("--cdi-root", type=Path, default=Path("/var/run/cdi"))
    plugin.add_argument(
        "--sim-machine-label",
        metavar="LABEL",
        help="with --sim: the Node's label LABEL, when it has one, names this node's simulated machine instead; "
        "{machine} in --sim-state and --host-driver-root stands for the machine chosen",
    )
    plugin.add_argument(
        "--sim-persistenced",
        action="store_true",
        help="with --sim: start the simulated machine's nvidia-persistenced, through which the simulated "
        "libnvidia-ml in containers given its GPUs reaches the machine (it outlives this process, not its container)",
    )
    plugin.add_argument(
        "--cdi-hook-path",
        help="NVIDIA's nvidia-cdi-hook (or nvidia-ctk) as the host's runtime finds it: CDI specs then use its "
        "update-ldcache and create-symlinks hooks instead of a bind mount per library link",
    )
    add_pod_uid_argument(
        plugin,
        "this pod's UID, put in the kubelet socket names (dra-<uid>.sock, <driver>-<uid>-reg.sock) so that the old "
        "and the new pod of a rolling update serve side by side (kubelets 1.33 and later)",
    )
    plugin.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    plugin.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        help="the address the metrics listen on (default 127.0.0.1: they have no authentication; 0.0.0.0 or the "
        "pod IP to be scraped from other hosts)",
    )
    plugin.add_argument(
        "--metrics-share-port",
        action="store_true",
        help="the metrics port is one of the node's (hostNetwork): take its listening socket from the pod serving it "
        "(through <plugin-dir>/metrics-handoff.sock) and hand it to the next, so that a rolling update surges and no "
        "scrape is refused or reset; bind it when no pod hands it over",
    )
    plugin.add_argument("--rediscover-seconds", type=float, default=60.0, help="how often to look at the GPUs again")
    plugin.add_argument(
        "--feature-gates",
        default=os.environ.get("DRA_DRIVER_FEATURE_GATES"),
        help=f"Name=true|false,... (defaults: {', '.join(f'{k}={v}' for k, v in sorted(features.DEFAULTS.items()))})",
    )
    plugin.add_argument(
        "--node-labels",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="label this Node with GPU facts in the driver's domain (needs RBAC patch on nodes)",
    )
    plugin.add_argument(
        "--ignored-xids",
        type=_xid_list,
        default=DEFAULT_IGNORED_XIDS,
        help="XIDs that never taint a device (comma-separated, replaces the default; '' taints on every XID; "
        f"default {','.join(map(str, sorted(DEFAULT_IGNORED_XIDS)))}: application errors)",
    )
    plugin.add_argument(
        "--node-configs",
        type=Path,
        help="JSON of named configurations ({name: {mode, replicas}}) that the Node's --node-config-label chooses "
        "from; without the label, --mode and --replicas (needs RBAC list and watch on nodes, create on events)",
    )
    plugin.add_argument("--node-config-label", default="", help="default: <driver>/config")
    plugin.set_defaults(func=cmd_plugin, k8s_version=None)  # None: ask the API server

    health = sub.add_parser("health", help="the node daemon's device health (run inside its pod)")
    health_sub = health.add_subparsers(dest="health_command", required=True)
    for name, help_text in (
        ("status", "taints, incidents, lost and unmonitored GPUs"),
        ("clear", "clear the XID/ECC incidents of a device (a device name or GPU UUID)"),
    ):
        p = health_sub.add_parser(name, help=help_text)
        p.add_argument("--driver", default=DEFAULT_DRIVER_NAME, help="driver name (for the default socket)")
        p.add_argument(
            "--socket",
            type=Path,
            help=f"the daemon's admin socket (default: ${HEALTH_SOCKET_ENV}, else "
            f"{DEFAULT_PLUGINS_DIR}/<driver>/health.sock)",
        )
        if name == "status":
            p.add_argument("-o", "--output", choices=["table", "json"], default="table")
            p.set_defaults(func=cmd_health_status)
        else:
            p.add_argument("device", help="device name (gpu-3, a MIG partition) or GPU UUID")
            p.set_defaults(func=cmd_health_clear)

    probe_cli.add_arguments(sub.add_parser("probe", help=probe_cli.HELP))

    sim = sub.add_parser("sim", help="simulated machines")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True)
    sim_sub.add_parser("list", help="list the named simulated machines").set_defaults(func=cmd_sim_list)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    jsonlog.configure(logging.WARNING - 10 * args.verbose)
    try:
        return int(args.func(args))
    except (DiscoveryError, SliceLimitError, KeyError, ValueError) as e:  # FeatureGateError is a ValueError
        message = e.args[0] if isinstance(e, KeyError) and e.args else e  # KeyError's str() adds quotes
        print(f"dra-driver: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
