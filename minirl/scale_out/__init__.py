"""Beyond one synchronous loop: the streaming data plane, the async and Ray drivers, load
balancing and the timeline they are drawn on."""
