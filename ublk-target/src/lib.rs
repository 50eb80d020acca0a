//! The ublk daemon (see issue "The ublk daemon").
