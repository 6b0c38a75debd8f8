// RefusalLog now lives in node/repeated_log.h, with RepeatedLog (one header for saying a
// repeated thing once with a count). This forwarding header stays only until the users'
// include lines (consensus/consensus_peer.h, ps/kv_server.h) are switched: they are being
// edited on other branches.
#pragma once

#include "node/repeated_log.h"
