"""Device actors, the rendezvous and the transports between them."""
