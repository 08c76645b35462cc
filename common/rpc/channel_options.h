#pragma once
// Channel settings shared by every client of a bitsplit service (coordinator -> drafter,
// drafter -> cpu-residual, tools). gRPC's default reconnect backoff grows to 120 s, so a peer
// that came back after an outage stayed unreachable for up to 15 s of refused requests; capping
// it at 500 ms makes the first request sent 1 s after the peer is SERVING find it connected.
// Keepalive pings find a peer whose host vanished without closing the connection.
#include <chrono>

#include "grpcpp/support/channel_arguments.h"

namespace bitsplit::rpc {

inline constexpr std::chrono::milliseconds kMaxReconnectBackoff{500};

// Arguments for a channel to a bitsplit peer whose messages may be up to `max_message_bytes`.
grpc::ChannelArguments PeerChannelArguments(int max_message_bytes);

}  // namespace bitsplit::rpc
