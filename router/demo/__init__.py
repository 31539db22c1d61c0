"""``stargate-router demo``: two local pods (gRPC over h2c and TLS, QUIC) on 127.0.0.2/.3 with a
throwaway CA, the router in front, one call per pod per protocol and the rejections."""
