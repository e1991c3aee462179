// Umbrella header of diaspora::core: the event model, specs, schemas, tokens, certificates,
// and the storage layer (files, CRC32C, framed records in segment files).
#pragma once

#include "diaspora/certs.hpp"
#include "diaspora/crc32c.hpp"
#include "diaspora/error.hpp"
#include "diaspora/event.hpp"
#include "diaspora/files.hpp"
#include "diaspora/json_schema.hpp"
#include "diaspora/payloads.hpp"
#include "diaspora/records.hpp"
#include "diaspora/spec.hpp"
#include "diaspora/thread_name.hpp"
#include "diaspora/token.hpp"
#include "diaspora/version.hpp"
