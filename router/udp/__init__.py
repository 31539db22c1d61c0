"""The QUIC edge: hold a new flow's first datagrams until its Initial's SNI is read, route it, then
splice datagrams both ways through a connected socket per flow, or refuse it with an Initial
``CONNECTION_CLOSE`` (docs/quic.md)."""
