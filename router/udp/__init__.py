"""The QUIC edge: hold a new flow's first datagrams until its Initial's SNI is read (``quic/``),
route it (``routing``), then splice datagrams both ways through a connected socket per flow
(``edge``, ``flow_table``, ``verdicts``, ``pod_link``, ``pod_to_client``, ``batching``), or refuse
with an Initial ``CONNECTION_CLOSE`` (``refusals``); every end of a flow is accounted for in
``flow_endings``."""
