"""What a service is given: the Service base, HeadAPI, the services' interfaces, NodeSide."""
