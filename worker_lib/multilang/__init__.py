"""KCL's MultiLang protocol, the daemon's side: ``shardlease multilang --properties FILE`` runs KCL MultiLang
applications (amazon-kclpy, aws-kcl, ...) unchanged, without Java (docs/multilang.md).

* :mod:`~worker_lib.multilang.messages` — the protocol's lines, pure;
* :mod:`~worker_lib.multilang.properties` — a MultiLangDaemon properties file, read as KCL reads it, pure;
* :mod:`~worker_lib.multilang.child` — one child process and its pipes;
* :mod:`~worker_lib.multilang.processor` — a record processor that is a child;
* :mod:`~worker_lib.multilang.daemon` — the command: properties, tables, a worker with the leader embedded.
"""

from __future__ import annotations

from worker_lib.multilang.processor import ChildRegistry, ChildSpec, MultiLangProcessor

__all__ = ["ChildRegistry", "ChildSpec", "MultiLangProcessor"]
