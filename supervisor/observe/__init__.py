"""What a service sees of the Supervisor's work besides the results of its calls.

Three outlets, fed once per batch of transitions by each app's actor:

- ``logging`` records on the ``supervisor`` logger (``records``), with the handle,
  role, replica, states and reason as structured ``extra``;
- one async stream of every transition of every app the Supervisor follows
  (``bus``, behind ``Supervisor.events()``);
- OpenTelemetry metrics (``metrics``), a no-op unless ``opentelemetry-api`` is
  installed (the ``otel`` extra) and the application set up an SDK.

The stream also carries the apps the Supervisor only observes (``attach`` while
their owner lives), as their records are read; those are not logged or counted
here, as their owner's process does that.

The actor only calls ``Observer.transitions`` and ``Observer.action``; what each
outlet does with them is its own business, so a slow event consumer or a logging
handler can never change how an app is supervised.
"""

from __future__ import annotations

from supervisor.observe.bus import AppEvent, EventBus, EventStream
from supervisor.observe.observer import Observer

__all__ = ["AppEvent", "EventBus", "EventStream", "Observer"]
