//! The Cluster API infrastructure-machine provider (spec 001) on top of our drivers (not built yet; the Cluster API
//! issue fills it).
