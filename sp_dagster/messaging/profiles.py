"""Broker profiles: which workarounds the Kafka layer runs for a broker's known departures from Kafka's
ordering. `tansu` reads again what a fetch stepped over (`skips.py`) and drops outputs a dead owner's
open transaction let through (`worker/instance/leaked_outputs.py`), `kafka` does neither;
`deployment.config.brokerProfile` chooses, `auto` by the broker's cluster id (docs/messaging.md).
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
    """The profile `name` selects (`auto`: `tansu` when the cluster id the broker reports begins with "tansu", else `kafka`)."""
    if name == "auto":
        return PROFILES["tansu" if (cluster_id or "").lower().startswith("tansu") else "kafka"]
    try:
        return PROFILES[name]
    except KeyError:
        raise MessagingError(f"unknown broker profile '{name}': set deployment.config.brokerProfile to one of {', '.join(CHOICES)}") from None
