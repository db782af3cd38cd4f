"""The chart's OTLP/HTTP port (guard.httpPort): the guard's --http-listen, the container port,
both Services and the ingress policy agree; 0 turns the receiver off everywhere."""

from __future__ import annotations

from _deploy_helm import FULLNAME, container, render


def _arg(c: dict, flag: str) -> str:
    args = c["args"]
    return args[args.index(flag) + 1]


def _service_ports(docs) -> dict[str, dict[str, int]]:
    return {
        name: {p["name"]: p["port"] for p in doc["spec"]["ports"]}
        for (kind, name), doc in docs.items()
        if kind == "Service" and name in (FULLNAME, f"{FULLNAME}-headless")
    }


def test_http_port_is_served_and_exposed_by_default():
    docs = render({"networkPolicy": {"enabled": True}})
    c = container(docs)
    assert _arg(c, "--http-listen") == "0.0.0.0:4318"
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["otlp-http"] == 4318
    services = _service_ports(docs)
    assert services and all(ports.get("otlp-http") == 4318 for ports in services.values())
    (policy,) = [d for (k, _), d in docs.items() if k == "NetworkPolicy"]
    allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert "otlp-http" in allowed


def test_http_port_zero_turns_the_receiver_off():
    docs = render({"guard": {"httpPort": 0}, "networkPolicy": {"enabled": True}})
    c = container(docs)
    assert _arg(c, "--http-listen") == "none"
    assert "otlp-http" not in {p["name"] for p in c["ports"]}
    assert all("otlp-http" not in ports for ports in _service_ports(docs).values())
