"""Sans-IO QUIC wire parsing for a router that never terminates QUIC: long/short headers, Initial
keys (v1 and v2), header protection and AEAD, CRYPTO reassembly, the bounded ClientHello walker
shared with TLS over TCP, and the few server packets the router sends (Initial
``CONNECTION_CLOSE``, Version Negotiation). Pure functions over bytes; imports nothing from
``router``."""
