"""The flags that say what an agent does when its host is taken: `ringmaster agent` has them, and
`ringmaster run` passes them on to the agents it starts (one definition, so they never differ).
Light on purpose: `run`'s parser builds them without importing the agent."""

from __future__ import annotations

import argparse

from ringmaster import settings as defaults


def add_drain_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drain-grace", type=float, default=defaults.DEFAULT_DRAIN_GRACE_S, metavar="S",
                        help="on SIGTERM or SIGINT an agent drains its host: its workers get this long to leave at "
                             "their next commit before they are stopped; a second signal stops them at once "
                             "(default: %(default)s, under Kubernetes' 30 s grace)")
    parser.add_argument("--preemption-notice-script", default=None, metavar="PATH",
                        help="run by each agent every --notice-interval (with $RINGMASTER_HOST set): nothing printed "
                             "means no notice, `drain SECONDS` drains the host (deploy/notice/ has AWS and GCP ones) "
                             "(default: none)")
    parser.add_argument("--notice-interval", type=float, default=defaults.DEFAULT_NOTICE_INTERVAL_S, metavar="S",
                        help="seconds between two runs of the notice script (default: %(default)s)")
