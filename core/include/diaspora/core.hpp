// Umbrella header of diaspora::core: the event model, specs, schemas, tokens, certificates.
#pragma once

#include "diaspora/certs.hpp"
#include "diaspora/error.hpp"
#include "diaspora/event.hpp"
#include "diaspora/json_schema.hpp"
#include "diaspora/payloads.hpp"
#include "diaspora/spec.hpp"
#include "diaspora/token.hpp"
#include "diaspora/version.hpp"
