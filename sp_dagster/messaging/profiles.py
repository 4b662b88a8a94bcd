"""Broker profiles: what the Kafka layer does around a broker's known departures from Kafka's ordering.

The embedded broker (tansu 0.6) stores the record batches of concurrent producers out of order and
lets an open transaction's messages through to a new owner of its transactional id. Two
workarounds cover that: readers read again what a fetch stepped over, guided by the writer stamps
every publisher adds (`skips.py`), and a new owner of an instance reads its outputs back for what
its predecessor's open transaction let through (`worker/instance/leaked_outputs.py`). Apache Kafka needs
neither, so they are a profile's, chosen by `deployment.config.brokerProfile`: `tansu`, `kafka`,
or `auto` (the default: `tansu` when the cluster id the broker reports begins with "tansu").
Tansu's third departure, a partition wedged by transactions ending at once, has no client-side
workaround (docs/messaging.md, bench/tansu_wedge.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from sp_dagster.messaging.errors import MessagingError


@dataclass(frozen=True)
class BrokerProfile:
    """What a broker needs from its clients beyond Kafka's own guarantees."""

    name: str
    reread_skips: bool  # publishers stamp every message; readers read again what a fetch stepped over
    probe_leaked: bool  # a new owner drops outputs its predecessor's open transaction let through


PROFILES = {
    "kafka": BrokerProfile("kafka", reread_skips=False, probe_leaked=False),
    "tansu": BrokerProfile("tansu", reread_skips=True, probe_leaked=True),
}
CHOICES = ("auto", *PROFILES)


def profile_for(name: str, cluster_id: str | None) -> BrokerProfile:
    """The profile `name` selects (`auto`: by the cluster id the broker reports)."""
    if name == "auto":
        return PROFILES["tansu" if (cluster_id or "").lower().startswith("tansu") else "kafka"]
    try:
        return PROFILES[name]
    except KeyError:
        raise MessagingError(f"unknown broker profile '{name}': set deployment.config.brokerProfile to one of {', '.join(CHOICES)}") from None
