//! Merge, JSON and strategic merge patches (being written).
